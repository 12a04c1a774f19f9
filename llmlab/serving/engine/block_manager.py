"""Paged KV cache bookkeeping: a pool of fixed-size blocks, a block table per sequence, a free list,
and a prefix cache of full blocks keyed by a hash chained to the parent block's hash.

The KV tensors themselves live in `model_runner.ModelRunner` as (layers, num_blocks * block_size,
kv_heads, head_dim): block b holds slots [b * block_size, (b + 1) * block_size). This module only
decides which block ids a sequence owns.

Free blocks keep their hash and contents until they are handed out again (taken from the left of
the free list; freed blocks go to the right, a sequence's tail first), so a block freed a while ago
can still be a prefix hit: that is the prefix cache, with LRU eviction for free.

References:
- Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
  PagedAttention" (vLLM): blocks, block tables, reference counts.
- nano-vllm `engine/block_manager.py`: hash of (parent hash, token ids) per full block, a hit is
  checked against the stored token ids, so a hash collision cannot return wrong KV.
- vLLM v1 prefix caching: only full blocks are cached; the last prompt token is always recomputed
  (its logits are needed), so at most (n - 1) // block_size blocks can hit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and its KV computed
    token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """A full block's key: its tokens chained to the parent block's key (so equal blocks after different
    prefixes differ)."""
    return hash((parent, token_ids))


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int = 16
    enable_prefix_cache: bool = True
    blocks: list[Block] = field(init=False)
    free: deque[int] = field(init=False)
    cached: dict[int, int] = field(init=False, default_factory=dict)  # hash -> block id

    def __post_init__(self):
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"need at least one block of at least one token, "
                             f"got {self.num_blocks} x {self.block_size}")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = deque(range(self.num_blocks))

    # ---------------------------------------------------------------- counts

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    # ---------------------------------------------------------------- one block

    def _take_free(self) -> int:
        """Hand out the least recently freed block; its old contents leave the prefix cache."""
        b = self.blocks[self.free.popleft()]
        if b.hash is not None and self.cached.get(b.hash) == b.block_id:
            del self.cached[b.hash]
        b.hash, b.token_ids, b.ref_count = None, (), 1
        return b.block_id

    def _share(self, block_id: int) -> None:
        b = self.blocks[block_id]
        if b.ref_count == 0:
            self.free.remove(block_id)  # O(free) but only on a prefix hit of a freed block
        b.ref_count += 1

    # ---------------------------------------------------------------- one sequence

    def match_prefix(self, block_table: list[int], token_ids: list[int]) -> int:
        """Take the cached full blocks that start `token_ids`; returns the number of tokens hit.

        `block_table` must be empty. At most (len - 1) // block_size blocks: the last token is always computed.
        """
        assert not block_table
        if not self.enable_prefix_cache:
            return 0
        parent = None
        for i in range((len(token_ids) - 1) // self.block_size):
            toks = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, toks)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != toks:
                break
            self._share(bid)
            block_table.append(bid)
            parent = h
        return len(block_table) * self.block_size

    def can_grow(self, block_table: list[int], n_tokens: int) -> bool:
        return self.blocks_for(n_tokens) - len(block_table) <= len(self.free)

    def grow(self, block_table: list[int], n_tokens: int) -> None:
        """Append fresh blocks until the table covers `n_tokens` positions (call can_grow first)."""
        while len(block_table) < self.blocks_for(n_tokens):
            block_table.append(self._take_free())

    def register_full(self, block_table: list[int], token_ids: list[int], n_computed: int, n_hashed: int) -> int:
        """Hash the blocks that became full (KV computed) since `n_hashed` blocks; returns the new count."""
        n_full = n_computed // self.block_size
        parent = self.blocks[block_table[n_hashed - 1]].hash if n_hashed else None
        for i in range(n_hashed, n_full):
            b = self.blocks[block_table[i]]
            toks = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            b.hash, b.token_ids = chain_hash(parent, toks), toks
            if self.enable_prefix_cache:
                self.cached.setdefault(b.hash, b.block_id)  # an equal block already cached stays the one hit
            parent = b.hash
        return max(n_full, n_hashed)

    def release(self, block_table: list[int]) -> None:
        """Drop a sequence's references; blocks nobody holds go back to the free list, tail first."""
        for bid in reversed(block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free.append(bid)
        block_table.clear()

    def import_prefix(self, token_ids: list[int]) -> list[int]:
        """Fresh blocks for the full blocks of `token_ids` whose K/V another engine computed, registered in the
        prefix cache under this process's own chain hashes (Python's hash of the chain's root differs between
        processes, so a sender's hashes are never reused). The caller writes the K/V into the returned blocks
        and holds them (ref count 1) until the request that hits them is admitted, then releases them."""
        table, parent = [], None
        for i in range(len(token_ids) // self.block_size):
            b = self.blocks[self._take_free()]
            b.token_ids = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            b.hash = parent = chain_hash(parent, b.token_ids)
            if self.enable_prefix_cache:
                self.cached.setdefault(b.hash, b.block_id)
            table.append(b.block_id)
        return table
