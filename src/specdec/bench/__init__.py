"""``specdec bench``: our methods and the peers' on Spec-Bench questions, interleaved in one run."""
