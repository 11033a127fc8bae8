// Compiles contracts/src/*.sol with the pinned solc-js (package.json), once per EVM target, and
// writes the artifacts (abi + bytecode): contracts/artifacts/<Contract>.json for the default
// target (cancun) and contracts/artifacts/<target>/<Contract>.json for each other one. A
// deployment names its target (DEFL_EVM_VERSION, `manage.py ledger deploy --evm-version`): a chain
// at an earlier hardfork (london: no PUSH0, no MCOPY, no transient storage) runs only code
// compiled for it. The ABI is the same for every target; only the bytecode differs.
// `--check` compiles in memory and exits 1 when a committed artifact differs from the sources or
// is missing (tests/contracts/test_artifacts.py).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import solc from "solc";

const here = path.dirname(fileURLToPath(import.meta.url));
const srcDir = path.join(here, "src");
const outDir = path.join(here, "artifacts");
const DEPLOYABLE = ["NodeRegistry", "DataRegistry", "JobLogic", "FederatedLearning", "CommitteeRuleHarness"];
// EIP-170 caps deployed code at 24,576 bytes; every contract stays below 80% of it on every
// target, so that the next protocol change still fits (a build that passes this line fails).
const CODE_SIZE_LIMIT = 24576;
const CODE_SIZE_BUDGET = Math.floor(CODE_SIZE_LIMIT * 0.8);
// solc-js defaults to the newest EVM (osaka); the default is one that anvil and py-evm both run.
// Keep in step with backend/ledger/artifacts.py (EVM_VERSIONS, DEFAULT_EVM_VERSION).
const DEFAULT_TARGET = "cancun";
const TARGETS = ["cancun", "shanghai", "london"];
const OPTIMIZER = { enabled: true, runs: 200 };

const sources = {};
for (const name of fs.readdirSync(srcDir).filter((f) => f.endsWith(".sol")).sort()) {
  sources[name] = { content: fs.readFileSync(path.join(srcDir, name), "utf8") };
}

function compile(evmVersion) {
  const settings = {
    evmVersion,
    optimizer: OPTIMIZER,
    metadata: { bytecodeHash: "none" },
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
  };
  const output = JSON.parse(solc.compile(JSON.stringify({ language: "Solidity", sources, settings })));
  // No contract reads block.prevrandao (a PoA chain's is a known constant, a PoS proposer's its own
  // choice): every draw comes from secrets the members committed to (FederatedLearning).
  for (const e of output.errors || []) console.error(`[${evmVersion}] ${e.formattedMessage}`);
  if ((output.errors || []).some((e) => e.severity === "error")) process.exit(2);
  const artifacts = {};
  for (const [source, contracts] of Object.entries(output.contracts)) {
    for (const [name, c] of Object.entries(contracts)) {
      if (!DEPLOYABLE.includes(name)) continue;
      const size = c.evm.deployedBytecode.object.length / 2;
      if (size > CODE_SIZE_BUDGET) {
        console.error(`[${evmVersion}] ${name} is ${size} bytes, over ${CODE_SIZE_BUDGET} (80% of ${CODE_SIZE_LIMIT})`);
        process.exit(3);
      }
      const artifact = {
        contractName: name,
        sourceName: `contracts/src/${source}`,
        compiler: { solc: solc.version(), settings: { evmVersion, optimizer: OPTIMIZER } },
        abi: c.abi,
        bytecode: "0x" + c.evm.bytecode.object,
        deployedBytecode: "0x" + c.evm.deployedBytecode.object,
      };
      artifacts[`${name}.json`] = JSON.stringify(artifact, null, 2) + "\n";
    }
  }
  return artifacts;
}

const check = process.argv.includes("--check");
const stale = [];
for (const target of TARGETS) {
  const dir = target === DEFAULT_TARGET ? outDir : path.join(outDir, target);
  for (const [file, text] of Object.entries(compile(target))) {
    const destination = path.join(dir, file);
    const current = fs.existsSync(destination) ? fs.readFileSync(destination, "utf8") : null;
    if (current === text) continue;
    if (check) stale.push(path.relative(outDir, destination));
    else {
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(destination, text);
      console.log(`wrote ${path.relative(process.cwd(), destination)}`);
    }
  }
}
if (check && stale.length) {
  console.error(`stale artifacts (run npm run compile): ${stale.join(", ")}`);
  process.exit(1);
}
if (check) console.log(`artifacts are current (${TARGETS.join(", ")})`);
