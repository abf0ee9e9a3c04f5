"""WordNet and geometry (docs/install.md): the WordNet source nltk reads, Wu–Palmer and path
similarity at scale, embedding and weight geometry, attention-head probes, and relational
alignment of an LM with WordNet. Imports ``core`` and ``lm``."""
