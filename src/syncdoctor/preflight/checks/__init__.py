"""One module per preflight check code: PF1xx rank table, PF2xx environment,
PF3xx training scripts, PF4xx code consistency across nodes."""
