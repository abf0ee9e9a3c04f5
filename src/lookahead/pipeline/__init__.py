"""One module or package per DVC stage (docs/pipeline.md): its config dataclass, ``build_<stage>`` and its
plots; ``stages/<stage>.py`` is the thin script dvc.yaml runs. A stage imports the libraries and
``artifacts``, never another stage (the control stage is part of ``phase2``: they share its section)."""
