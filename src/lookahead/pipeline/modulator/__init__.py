"""The modulator stage: the geometric LERP modulator trained on the frozen base, before/after figures."""
