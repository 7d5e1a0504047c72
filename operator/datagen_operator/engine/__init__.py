"""SGLang: what it accepts, how to launch it, how to talk to it, and a CPU simulator of its API."""
