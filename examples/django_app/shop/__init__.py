"""The example's one application: views limited by moderato.django."""
