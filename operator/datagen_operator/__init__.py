"""datagen-operator: LLM generation runs on SGLang with data-faithfulness proofs."""

__version__ = "0.1.0"
