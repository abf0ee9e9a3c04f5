"""Infrastructure every stage uses and that imports nothing else of ours (docs/tracking.md):
errors a user can fix, strict typed config, the stage command line, atomic writes, input checks,
metrics/report files, MLflow tracking, devices and seed spreads.

An edit here reruns every stage: dvc.yaml lists this directory as one dep of each."""
