"""The user's own command as a trial (`autotune ... -- <command>`): the command, its memory and
steps read from outside, and the in-job hook. The map: trial/README.md."""
