"""The probe stage: geometry, head statistics and WordNet alignment of the base and reference LMs."""
