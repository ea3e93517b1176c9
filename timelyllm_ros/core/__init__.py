"""Pure scheduling core: no I/O, time from an injected clock."""
