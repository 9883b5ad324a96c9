"""Payload encryption: what ferry writes into Temporal's history is ciphertext, readable only with its keys.

Migration specs name databases, buckets and Secrets, and failure messages quote them;
Temporal stores every payload and failure for as long as it keeps a history. A codec
encrypts them in the client, so the Temporal service (and whoever reads its database)
holds ciphertext only. `keys` reads the keys, `encryption` is the codec, `events` decodes
a history fetched raw, and `server` lends the codec to the Web UI and the temporal CLI.
"""
