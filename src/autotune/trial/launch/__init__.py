"""The tuner side of a trial: which launcher, and the launchers that start, watch and stop the trial's
processes (this process never imports torch). The map: trial/README.md."""
