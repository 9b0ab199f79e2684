"""The kernel cache: verified kernels by (problem key, environment fingerprint), and packs that carry them."""
