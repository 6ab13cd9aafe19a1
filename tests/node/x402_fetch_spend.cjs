// npm @x402/fetch (x402 v2) paying a shop's 402, driven by tests/test_x402_docs.py to check the spend
// controls docs/x402.md gives. Reads JSON on stdin: {"privateKey", "paymentRequired" (the shop's
// PAYMENT-REQUIRED header), "spendControls" (a JavaScript object expression, as the docs write it, or
// null for the client's defaults)}. fetch is a stand-in that answers the shop's 402 first, then takes
// the paid re-send: prints {"paymentSignature": <its PAYMENT-SIGNATURE header>} or {"error": <message>}.
// Run with NODE_PATH=.peers/npm/node_modules (the test does).
const { wrapFetchWithPaymentFromConfig } = require("@x402/fetch");
const { ExactEvmScheme } = require("@x402/evm");
const { privateKeyToAccount } = require("viem/accounts");

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const { privateKey, paymentRequired, spendControls } = JSON.parse(Buffer.concat(chunks).toString());
  let paymentSignature = null;
  const shop = async (input, init) => {
    const sent = new Headers((input instanceof Request ? input.headers : undefined) || (init && init.headers));
    if (sent.get("PAYMENT-SIGNATURE")) {
      paymentSignature = sent.get("PAYMENT-SIGNATURE");
      return new Response("{}", { status: 201, headers: { "Content-Type": "application/json" } });
    }
    return new Response("{}", { status: 402, headers: { "PAYMENT-REQUIRED": paymentRequired } });
  };
  const config = { schemes: [{ network: "eip155:8453", client: new ExactEvmScheme(privateKeyToAccount(privateKey)) }] };
  if (spendControls !== null) config.spendControls = new Function(`return (${spendControls});`)();
  try {
    await wrapFetchWithPaymentFromConfig(shop, config)("https://shop.example/v1/topups", { method: "POST" });
    process.stdout.write(JSON.stringify({ paymentSignature }));
  } catch (error) {
    process.stdout.write(JSON.stringify({ error: String(error && error.message ? error.message : error) }));
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
