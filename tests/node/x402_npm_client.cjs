// Makes an X-PAYMENT header with the npm x402 client (createPaymentHeader) and a viem wallet.
// Reads {"privateKey", "rpcUrl", "requirements"} as JSON on stdin; prints the header on stdout.
// Used by tests/test_x402.py to prove the shop accepts what the official JavaScript client sends.
// Run with NODE_PATH=.peers/npm/node_modules (the test does).
const { createPaymentHeader } = require("x402/client");
const { createWalletClient, http, publicActions } = require("viem");
const { privateKeyToAccount } = require("viem/accounts");
const { base } = require("viem/chains");

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const { privateKey, rpcUrl, requirements } = JSON.parse(Buffer.concat(chunks).toString());
  const wallet = createWalletClient({
    account: privateKeyToAccount(privateKey),
    chain: base,
    transport: http(rpcUrl),
  }).extend(publicActions);
  process.stdout.write(await createPaymentHeader(wallet, 1, requirements));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
