"""The fault lab: real multi-process data-parallel training with named faults."""
