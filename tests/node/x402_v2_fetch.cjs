// npm @x402/fetch (x402 v2) POSTing to the shop, unmodified apart from its spend controls: driven by
// tests/test_x402_signup.py. Reads JSON on stdin: {"privateKey", "url", "body", "asset" (the test USDC, which
// the spend controls allow)}; prints {"status", "body"} of the answer. Run with NODE_PATH=.peers/npm/node_modules.
const { wrapFetchWithPaymentFromConfig } = require("@x402/fetch");
const { ExactEvmScheme } = require("@x402/evm");
const { privateKeyToAccount } = require("viem/accounts");

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const { privateKey, url, body, asset } = JSON.parse(Buffer.concat(chunks).toString());
  const pay = wrapFetchWithPaymentFromConfig(fetch, {
    schemes: [{ network: "eip155:8453", client: new ExactEvmScheme(privateKeyToAccount(privateKey)) }],
    spendControls: { allowedAssets: [{ network: "eip155:8453", asset }] },
  });
  const answer = await pay(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  process.stdout.write(JSON.stringify({ status: answer.status, body: await answer.json() }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
