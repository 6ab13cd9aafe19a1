// The npm x402 clients, driven by tests/test_x402_clients.py and tests/test_x402_orders.py to prove the shop accepts what they send.
// Reads JSON on stdin: {"privateKey", "rpcUrl"} and either
//   "requirements": one x402 v1 accepts entry -> prints the X-PAYMENT header (x402/client createPaymentHeader)
//   "url": a paid resource -> POSTs to it with x402-fetch's wrapFetchWithPayment and prints
//          {"status", "body", "paymentResponse"} as JSON; optional "headers" are sent too (Authorization),
//          optional "body" is the JSON request body (default: a 25 USD USDCBASE top-up).
// Run with NODE_PATH=.peers/npm/node_modules (the test does).
const { createWalletClient, http, publicActions } = require("viem");
const { privateKeyToAccount } = require("viem/accounts");
const { base } = require("viem/chains");

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const { privateKey, rpcUrl, requirements, url, headers, body } = JSON.parse(Buffer.concat(chunks).toString());
  const wallet = createWalletClient({
    account: privateKeyToAccount(privateKey),
    chain: base,
    transport: http(rpcUrl),
  }).extend(publicActions);

  if (requirements) {
    const { createPaymentHeader } = require("x402/client");
    process.stdout.write(await createPaymentHeader(wallet, 1, requirements));
    return;
  }
  const { wrapFetchWithPayment } = require("x402-fetch");
  const pay = wrapFetchWithPayment(fetch, wallet, BigInt(2000 * 1e6)); // allow up to the 2000 USD top-up
  const response = await pay(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(headers || {}) },
    body: JSON.stringify(body || { amount: 25, coin: "USDCBASE" }),
  });
  process.stdout.write(
    JSON.stringify({
      status: response.status,
      body: await response.json(),
      paymentResponse: response.headers.get("X-PAYMENT-RESPONSE"),
    }),
  );
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
