"""Process and file-system plumbing: atomic writes, cache paths, shared-directory trust, signed rows,
environment variables, SIGTERM handling and leftover cleanup.
"""
