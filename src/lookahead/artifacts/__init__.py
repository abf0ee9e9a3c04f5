"""Readers of one stage's outputs that later stages use: the context cache, the wordnet tables,
the pairs file, the phase-2 directory. A helper two stages share moves here (or into a library),
never sideways from the stage that wrote it first."""
