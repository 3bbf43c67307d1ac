"""`syncdoctor experiment`: rerun the user's job under controlled variants (docs/experiment.md)."""
