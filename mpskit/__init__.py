"""mpskit: LLM fine-tuning that fits in memory on Macs and small machines, run through LLaMA-Factory."""

__version__ = "0.1.0"
