// Compiles contracts/src/*.sol with the pinned solc-js (package.json) and writes
// contracts/artifacts/<Contract>.json (abi + bytecode). `--check` compiles in memory and exits 1
// when the committed artifacts differ from the sources (used by tests/contracts/test_artifacts.py).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import solc from "solc";

const here = path.dirname(fileURLToPath(import.meta.url));
const srcDir = path.join(here, "src");
const outDir = path.join(here, "artifacts");
const DEPLOYABLE = ["NodeRegistry", "DataRegistry", "FederatedLearning", "CommitteeRuleHarness"];
const SETTINGS = {
  // solc-js defaults to the newest EVM (osaka); pin one that anvil and py-evm both run.
  evmVersion: "cancun",
  optimizer: { enabled: true, runs: 200 },
  metadata: { bytecodeHash: "none" },
  outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
};

const sources = {};
for (const name of fs.readdirSync(srcDir).filter((f) => f.endsWith(".sol")).sort()) {
  sources[name] = { content: fs.readFileSync(path.join(srcDir, name), "utf8") };
}
const output = JSON.parse(solc.compile(JSON.stringify({ language: "Solidity", sources, settings: SETTINGS })));
const errors = (output.errors || []).filter((e) => e.severity === "error");
for (const e of output.errors || []) console.error(e.formattedMessage);
if (errors.length) process.exit(2);

const artifacts = {};
for (const [source, contracts] of Object.entries(output.contracts)) {
  for (const [name, c] of Object.entries(contracts)) {
    if (!DEPLOYABLE.includes(name)) continue;
    const artifact = {
      contractName: name,
      sourceName: `contracts/src/${source}`,
      compiler: { solc: solc.version(), settings: { evmVersion: SETTINGS.evmVersion, optimizer: SETTINGS.optimizer } },
      abi: c.abi,
      bytecode: "0x" + c.evm.bytecode.object,
      deployedBytecode: "0x" + c.evm.deployedBytecode.object,
    };
    artifacts[`${name}.json`] = JSON.stringify(artifact, null, 2) + "\n";
  }
}

const check = process.argv.includes("--check");
let stale = [];
for (const [file, text] of Object.entries(artifacts)) {
  const target = path.join(outDir, file);
  const current = fs.existsSync(target) ? fs.readFileSync(target, "utf8") : null;
  if (current === text) continue;
  if (check) stale.push(file);
  else {
    fs.mkdirSync(outDir, { recursive: true });
    fs.writeFileSync(target, text);
    console.log(`wrote ${path.relative(process.cwd(), target)}`);
  }
}
if (check && stale.length) {
  console.error(`stale artifacts (run npm run compile): ${stale.join(", ")}`);
  process.exit(1);
}
if (check) console.log("artifacts are current");
