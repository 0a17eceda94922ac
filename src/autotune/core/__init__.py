"""Pure values every step shares: the ladder and its candidates, units, the global batch, stop reasons,
measurements, the string choices and the DeepSpeed version the code was read against. No I/O, no torch.
"""
