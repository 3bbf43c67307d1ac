"""The preflight part of syncdoctor."""
