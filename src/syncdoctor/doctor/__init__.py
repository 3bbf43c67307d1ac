"""The doctor part of syncdoctor."""
