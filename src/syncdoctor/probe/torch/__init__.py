"""The torch adapter: the probe on a torch model and optimizer (`probe`), its store
exchange for the live check (`check`), heal by broadcast (`heal`), tensor fingerprints,
the snapshot, the canary forward, mesh layouts from live DTensors, the hooks on the live
objects, and the zero-code attach (`attach`). The subpackage's name does not shadow
torch: imports are absolute."""
