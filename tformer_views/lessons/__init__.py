"""The lecture pages' logic: attention step by step, positional encodings."""
