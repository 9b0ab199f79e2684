"""What a deployment sets for the serving integrations, and the reasons a served call falls back to the stack's own
path, as counted.

Configuration a deployment sets (no code in the user's program; ``ks_core.settings`` documents each):

* ``KERNELSMITH_PACK``: the pack to serve from.
* ``KERNELSMITH_TRUSTED_KEYS``: comma-separated ed25519 public keys (files, or base64/hex of the raw bytes); when
  set, an unsigned pack or one signed by another key is refused.
* ``KERNELSMITH_DISABLE=1``: serve nothing; every stack keeps its own kernels.
* ``KERNELSMITH_SERVE_RACE`` (``auto``, ``1``, ``0``) and ``KERNELSMITH_SERVE_MARGIN``: whether a kernel that passed
  its device check is timed against the stack's own path for its op before it serves, and by how much it must win
  (:mod:`integrations.race`).
"""

from __future__ import annotations

import os

from ks_core.settings import VARIABLES, Settings

# The variables these settings come from (ks_core.settings documents each), for messages and tests.
ENV_PACK = VARIABLES["pack"].env
ENV_TRUSTED_KEYS = VARIABLES["trusted_keys"].env
ENV_DISABLE = VARIABLES["disabled"].env
ENV_SERVE_RACE = VARIABLES["serve_race"].env
ENV_SERVE_MARGIN = VARIABLES["serve_margin"].env
# Every variable a deployment sets for the integrations (a test clears them all to start from none).
SERVING_ENV = (ENV_PACK, ENV_TRUSTED_KEYS, ENV_DISABLE, ENV_SERVE_RACE, ENV_SERVE_MARGIN)

# Fallback reasons, as counted.
R_DISABLED = "disabled"
R_DEVICE = "device"
R_DTYPE = "dtype"
R_SHAPE = "shape"
R_STRIDE = "stride"
R_CALL = "call form"
R_VECTORS = "failed its device check"
R_NO_VECTORS = "no golden vectors"
R_ERROR = "kernel error"
R_OUTPUT = "bad output"
R_GRAD = "autograd"
R_SLOWER = "slower than the stack's own"
R_SIGNATURE = "failed its check at this signature"
R_DECLINED = "declined by its plan"


# ``os.environ.get`` encodes the name and decodes the value at each read (about half a microsecond, a tenth of a
# served call's budget on the host); CPython's ``os.environ`` keeps the encoded mapping its writes update, which
# is read directly where it exists.
_DISABLE_KEY = os.environ.encodekey(ENV_DISABLE) if hasattr(os.environ, "encodekey") else None


def disabled() -> bool:
    """The kill switch, read on every served call so that it works on a running server too: an unset variable
    costs one dict lookup."""
    data = getattr(os.environ, "_data", None)
    if data is not None and _DISABLE_KEY is not None and _DISABLE_KEY not in data:
        return False
    raw = os.environ.get(ENV_DISABLE)
    return bool(raw) and bool(VARIABLES["disabled"].parse(raw))


def trusted_keys_from_env() -> list[str] | None:
    raw = Settings.read("trusted_keys")
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    return keys or None
