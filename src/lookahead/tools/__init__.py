"""Command-line helpers no stage runs (nothing but ``tools`` imports them): the params check (with
the ``launch`` section dvc.yaml interpolates into the training stages' commands), sharing to a
remote, verifying a run against git, the offline plots page, and the fault tools the reliability
tests use."""
