"""The chaos run: real workers, beat and a triggerer SIGKILLed under load (issue 7)."""
