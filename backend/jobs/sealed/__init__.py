"""Sealed updates: nobody reads a trainer's update before the round's training deadline.

An update's reference is in the public ``UpdateSubmitted`` event while the round still trains,
so a blob stored in the clear could be read, lightly altered and resubmitted by any member. The
trainer therefore stores its update encrypted (AES-256-GCM under a fresh random key, never
derived from anything public) and submits the sealed blob's reference with the hash of the
PLAINTEXT, so duplicate and hash checks keep their meaning. The key stays in this node's
database (``UpdateKey``) until the training is over by the chain's clock: the round left
training, its update deadline passed, or every trainer's update is in (nobody can submit after
that). Then it is served to the job's participants only, over a node-signed peer request
(``backend.peers.guard.peer_signed``: signature, freshness, receiver, registry membership,
replay and rate), and only for an update on chain with this reference and hash.

Every node that obtains a key checks it (the blob opens, and the plaintext hashes to the content
hash on chain), keeps it and serves it on: a trainer that went offline once the committee
fetched its key does not stop the aggregation. A key that never arrives makes the update
unreadable, which the committee scores 0 like any other unreadable update.

One module per part:

- ``envelope``: seal and unseal (AES-256-GCM; the blob's format and its checks);
- ``key_store``: this node's key rows, its own update's and every key it checked;
- ``key_release``: a holder's side, when a round's keys may go out and to whom (``answer``);
- ``key_requests``: an asker's side, whom to ask (the trainer, then relays), over the peer API;
- ``key_gathering``: a round's keys asked for at once, or ahead, offered to the reader;
- ``reader``: a sealed update's plaintext, its key from the rows, an offer or the holders.
"""
