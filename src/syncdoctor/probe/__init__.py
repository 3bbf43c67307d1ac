"""The probe part of syncdoctor."""
