"""The phase1 stage: the lookahead structure predictor trained on the frozen LM, and its plots."""
