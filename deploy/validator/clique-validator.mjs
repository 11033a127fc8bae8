// Runs the EthereumJS client (@ethereumjs/client, pinned in package.json) as a Clique validator.
// Arguments are the client's own (`--gethGenesis`, `--unlock`, `--mine`, `--bootnodes`...).
//
// Its 0.10.5 release, on a Clique chain, seals empty blocks only: three defects of its v10
// libraries stop every contract call and every transaction (1-3), and its sealing forks the
// chain in ways it does not recover from (4). They are mended here, before the client starts,
// by wrapping methods of the very modules it imports (node resolves each module once); nothing
// is changed on disk. tests/devnet/test_validators.py runs transactions through it.
//
// 1. Its VM is made without the `cliqueSigner` EVM option, which the EVM demands on a Clique
//    chain before it runs any contract code ("Must include cliqueSigner function if clique/poa
//    is being used"): every eth_call, estimate and contract transaction failed. It gets
//    @ethereumjs/block's own `cliqueSigner` (the sealer recovered from the header's signature).
// 2. The block builder runs each pooled transaction in a scratch block made without the
//    sealer's signature: refused by the Clique header check (every transaction was skipped),
//    and, past that check, a block whose fees would go to the zero address instead of the
//    sealer (the sealed block's state root would then differ from its execution's). The
//    scratch block is sealed by the builder's own signer, as the sealed block will be.
// 3. eth_estimateGas runs the call in a scratch header without extraData, which the same header
//    check refuses. A header without any extraData is exempt from that format check: a sealed
//    header carries its 65-byte signature, and a block received without one still fails the
//    Clique signature check of block validation (the signer recovered from no signature is the
//    zero address, never a validator), so nothing a peer sends gets past it.
import { BlockHeader, cliqueSigner, createSealedCliqueBlock } from "@ethereumjs/block";
import { EVM } from "@ethereumjs/evm";
import { Blob4844Tx } from "@ethereumjs/tx";
import { EthereumJSErrorWithoutCode, TypeOutput, hexToBytes, toType } from "@ethereumjs/util";
import { BlockBuilder, runTx } from "@ethereumjs/vm";
import { Config } from "@ethereumjs/client/dist/esm/src/config.js";
import { Miner } from "@ethereumjs/client/dist/esm/src/miner/miner.js";
import { FullSynchronizer } from "@ethereumjs/client/dist/esm/src/sync/fullsync.js";
import { readFileSync } from "node:fs";

// 1.
const runInterpreter = EVM.prototype.runInterpreter;
EVM.prototype.runInterpreter = function runInterpreterWithSigner(...args) {
  this._optsCached.cliqueSigner ??= cliqueSigner;
  return runInterpreter.apply(this, args);
};

// 2. BlockBuilder.addTransaction of @ethereumjs/vm 10.0.0, with its scratch block sealed.
const addTransaction = BlockBuilder.prototype.addTransaction;
BlockBuilder.prototype.addTransaction = async function addSealedTransaction(tx, options = {}) {
  const signer = this.blockOpts.cliqueSigner;
  if (signer === undefined) return addTransaction.call(this, tx, options);
  if (tx instanceof Blob4844Tx) throw EthereumJSErrorWithoutCode("a Clique validator seals no blob transaction");
  this.checkStatus();
  if (!this.checkpointed) {
    await this.vm.evm.journal.checkpoint();
    this.checkpointed = true;
  }
  const blockGasRemaining = toType(this.headerData.gasLimit, TypeOutput.BigInt) - this.gasUsed;
  if (tx.gasLimit > blockGasRemaining) {
    // the miner reads this exact message as "the block is full"
    throw EthereumJSErrorWithoutCode("tx has a higher gas limit than the remaining gas in the block");
  }
  const header = { ...this.headerData, gasUsed: this.gasUsed };
  const block = createSealedCliqueBlock({ header, transactions: this.transactions }, signer, this.blockOpts);
  const result = await runTx(this.vm, { tx, block, skipHardForkValidation: options.skipHardForkValidation });
  this.transactions.push(tx);
  this.transactionResults.push(result);
  this.gasUsed += result.totalGasSpent;
  this._minerValue += result.minerValue;
  return result;
};

// 3.
const validateFormat = BlockHeader.prototype._consensusFormatValidation;
BlockHeader.prototype._consensusFormatValidation = function consensusFormatValidation() {
  if (this.common.consensusAlgorithm() === "clique" && this.extraData.length === 0) return;
  return validateFormat.call(this);
};

// 4. When it seals. The client seals out of turn after a random 0..n*500 ms, on whatever head
//    it has, with or without peers: a validator that (re)starts before it has synced seals a
//    block of its own on a stale head, two out-of-turn sealers race, and the chain forks. This
//    client does not recover from a fork it sealed itself (probed: it then imports no block of
//    the heavier branch and stays behind for good), so forks are avoided by the sealing policy,
//    which Clique leaves to each validator (any authorised signer may seal; the in-turn block
//    weighs more). An out-of-turn validator waits one more period per place it stands behind the
//    in-turn one in the rotation, so a missed turn is filled by the next in line alone, a period
//    before any other. And a validator seals only in step with its peers: it has a peer, is not
//    behind the height they announce, and a peer has announced a new block to it since it
//    started, so a validator that starts first hears the live chain (a batch it fetched at
//    start may already be stale). A fresh chain starts with the in-turn sealer of each block of
//    its first rotation (block 1 alone, each next one once it holds the block before): a
//    validator joining a young chain syncs its blocks rather than hearing them announced, and
//    Clique bars a signer from sealing again within floor(n/2)+1 blocks, so with five validators
//    the sealers of blocks 1 and 2 could not seal block 3 and the three that joined after them
//    had heard nothing announced: the chain stopped at block 2 (probed).
//    A block announced above its head counts as "behind" too: the client drops an announced
//    block more than one above its head without noting its height anywhere.
let lastAnnouncedAt = 0; // 0: no block announced since this validator started
let highestAnnounced = 0n;
function announced(number) {
  lastAnnouncedAt = Date.now();
  if (number > highestAnnounced) highestAnnounced = number;
}
const handleNewBlock = FullSynchronizer.prototype.handleNewBlock;
FullSynchronizer.prototype.handleNewBlock = async function handleAnnouncedBlock(block, peer) {
  if (peer !== undefined) announced(block.header.number);
  // A block it sealed goes whole to every peer (the client sends it to the square root of its
  // peers and only the hash to the others, which then wait for a sync round to fetch it): a
  // consortium has a handful of validators, each should hold the head a moment after it is sealed.
  else await this.sendNewBlock(block, this.pool.peers);
  return handleNewBlock.call(this, block, peer);
};
const handleNewBlockHashes = FullSynchronizer.prototype.handleNewBlockHashes;
FullSynchronizer.prototype.handleNewBlockHashes = function handleAnnouncedHashes(data) {
  for (const [, number] of data) announced(BigInt(number));
  return handleNewBlockHashes.call(this, data);
};
const assembleBlock = Miner.prototype.assembleBlock;
//    It also seals only on a head it has executed: the client imports a block before it runs it,
//    and its miner, building on a head whose state is not there yet, threw an uncaught error that
//    shut the whole client down (probed). Any other error of an assembly is logged and the next
//    one queued, instead of leaving the miner marked busy for good.
Miner.prototype.assembleBlock = async function assembleInStep() {
  const height = this.service.chain.headers.height;
  let reason = await outOfStep(this, height);
  const head = this.service.chain.blocks.latest;
  if (reason === null && !(await this.execution.vm.stateManager.hasStateRoot(head.header.stateRoot))) {
    reason = "its head is not executed yet";
  }
  if (reason !== null) {
    this.config.logger?.info(`Miner: not sealing on block ${height}: ${reason}`);
    return this.queueNextAssembly(this.period);
  }
  try {
    return await assembleBlock.call(this);
  } catch (error) {
    this.assembling = false;
    this.config.logger?.warn(`Miner: sealing on block ${height} failed (${error.message}); trying again`);
    return this.queueNextAssembly(this.period);
  }
};
Miner.prototype.queueNextAssembly = async function queueInRotation(timeout) {
  if (this._nextAssemblyTimeoutId) clearTimeout(this._nextAssemblyTimeoutId);
  if (!this.running) return;
  const number = this.service.chain.blocks.latest.header.number + 1n;
  const place = await rotationPlace(this, number);
  this._nextAssemblyTimeoutId = setTimeout(this.assembleBlock.bind(this), (timeout ?? this.period) + place * this.period);
};

//    A validator started with CLIQUE_REJOINING=1 (its data wiped after it forked, the chain long
//    past its first rotation) never starts a chain: at height 0 it would otherwise seal a block 1
//    of its own before it has synced the live one.
const rejoining = process.env.CLIQUE_REJOINING === "1";
async function outOfStep(miner, height) {
  const signers = miner.service.chain.blockchain.consensus.cliqueActiveSigners(height + 1n).length;
  const startsChain = !rejoining && height < BigInt(signers) && (await rotationPlace(miner, height + 1n)) === 0;
  if (height === 0n && startsChain) return null;
  if (miner.service.pool.peers.length === 0) return "no peer";
  if ((miner.config.syncTargetHeight ?? 0n) > height || highestAnnounced > height) return "behind its peers";
  if (startsChain || lastAnnouncedAt > 0) return null;
  return "no block announced by a peer since it started";
}

async function rotationPlace(miner, number) {
  const signers = miner.service.chain.blockchain.consensus.cliqueActiveSigners(number);
  const index = signers.findIndex((address) => address.equals(miner.config.accounts[0][0]));
  return index < 0 ? signers.length : (index - Number(number % BigInt(signers.length)) + signers.length) % signers.length;
}

// 5. From whom it syncs. Its full sync picks a peer whose total difficulty, as that peer said at
//    the handshake, is at least its own, and never learns a newer one: once a validator has
//    passed what its peers had when they met, it finds no peer to sync from, an announced block
//    that is not a child of its head is dropped, and it stays behind for good (probed: a third
//    validator stuck at block 4 while the others passed 30). Any peer will do: the sync asks the
//    chosen peer for its latest header before it fetches anything.
FullSynchronizer.prototype.best = async function bestAnnouncingPeer() {
  const peers = this.pool.peers.filter((peer) => peer.eth?.status !== undefined);
  if (peers.length < this.config.minPeers && !this.forceSync) return undefined;
  return peers.reduce((best, peer) => (best === undefined || peer.eth.status.td > best.eth.status.td ? peer : best), undefined);
};

// Its devp2p identity (the enode's id, which the other validators dial) from a key file the
// operator keeps, when CLIQUE_P2P_KEY_FILE names one: the client otherwise draws a random one into
// its data directory, which no other organization can know in advance.
const p2pKeyFile = process.env.CLIQUE_P2P_KEY_FILE;
if (p2pKeyFile) {
  const key = hexToBytes(`0x${readFileSync(p2pKeyFile, "utf8").trim().replace(/^0x/, "")}`);
  if (key.length !== 32) throw new Error(`${p2pKeyFile} must hold a 32-byte hex key`);
  Config.getClientKey = async () => key;
}

await import("@ethereumjs/client/dist/esm/bin/cli.js");
