"""What the emulator reads from users and writes for itself: YAML from users, read as untrusted input
(`untrusted_yaml`), and JSON documents with parts encoded ahead (`encoded_json`).

The lowest layer of the emulator: it imports nothing of the project.
"""
