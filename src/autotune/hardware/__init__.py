"""Step 1, probe: what the machine has (NVML, host RAM, NVMe), accelerator specs from the shipped
profiles, and the target a plan or tuning is sized for.
"""
