"""The foundation every kernelsmith package reads: the settings (every environment variable), the version,
environment fingerprints and a problem's plain record. It imports no other kernelsmith package, so that the cache,
the compiler, the integrations and the command all stand on the same definitions."""
