import re
from pathlib import Path

from setuptools import find_packages, setup

# The one place the version is written: ks_core/version.py (every package reads it from there).
VERSION = re.search(r'__version__ = "([^"]+)"', (Path(__file__).parent / "ks_core" / "version.py").read_text())[1]

setup(
    name="kernelsmith",
    version=VERSION,
    description="Evolutionary Triton kernel optimizer and torch.compile backend with a verified kernel cache",
    python_requires=">=3.10",
    # Installed top-level names are kernelsmith's own: ks_core, kernel_cache, ks_inductor and
    # kernelsmith_integrations (the repository's integrations/ folder; a bare "integrations" would collide with
    # other projects' packages). The benchmarks are the repository's programs and are not installed (kernelsmith
    # bench runs them from a checkout).
    packages=[*find_packages(include=["ks_core*", "kernel_cache*", "ks_inductor*"]), "kernelsmith_integrations"],
    package_dir={"kernelsmith_integrations": "integrations"},
    # The catalogue's problem files are KernelBench sources read by path, not modules of a package.
    package_data={"ks_inductor": ["seeds/families/*.py", "catalogue/problems/*.py", "catalogue/problems/cpu/*.py"]},
    install_requires=[
        "torch>=2.11",
        "triton>=3.6",
        "sqlalchemy>=2.0",
        "openai>=1.0",
        "safetensors>=0.4",
        "rich>=13",
        "numpy",
        "pytest-benchmark>=4",
    ],
    extras_require={
        # transformers: tests/test_hf_llama_backend.py and the --hf-config path of `kernelsmith warm` (random
        # weights from a config, nothing downloaded); it does not depend on torch, so it pulls no CUDA build.
        # psycopg: the PostgreSQL cache (tests/test_cache_postgres.py runs it against a throwaway server).
        # ray: `kernelsmith warm --ray` (tests/test_warm_ray.py starts a local cluster); a 76 MB wheel, ~11 s to
        # install.
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist", "ruff", "matplotlib", "cryptography", "transformers>=5.23",
                "psycopg[binary]>=3.1", "ray>=2.9"],
        "postgres": ["psycopg[binary]>=3.1"],
        "ray": ["ray>=2.9"],
        "sign": ["cryptography"],
        "plots": ["matplotlib"],
    },
    entry_points={
        "console_scripts": ["kernelsmith = ks_inductor.cli:main"],
        # Dynamo discovers this lazily; the target module must not register the name itself.
        "torch_dynamo_backends": ["kernelsmith = ks_inductor.compiler.backend:kernelsmith_backend"],
        # vLLM calls it in every process; it does nothing unless KERNELSMITH_PACK names a pack.
        "vllm.general_plugins": ["kernelsmith = kernelsmith_integrations.vllm:register"],
        # SGLang's load_plugins() calls it in every process (SGLANG_PLUGINS filters by name); inert unless
        # KERNELSMITH_PACK names a pack.
        "sglang.srt.plugins": ["kernelsmith = kernelsmith_integrations.sglang:register"],
    },
)
