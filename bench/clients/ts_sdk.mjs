// Bench driver on the official TypeScript SDK: Client over StdioClientTransport
// or StreamableHTTPClientTransport, loaded from target/test-env (made by
// scripts/test-env.sh; $FERREPL_TEST_ENV overrides it).
//
//     node ts_sdk.mjs [--calls N] [--warmup W] (--url URL | -- CMD ARGS...)
//
// Prints one JSON line, as the Python drivers do (see _common.py).

import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const ENV_DIR = process.env.FERREPL_TEST_ENV || path.join(ROOT, 'target/test-env');
// The SDK lives outside this tree, so bare specifiers cannot reach it.
const SDK = path.join(ENV_DIR, 'node/node_modules/@modelcontextprotocol/sdk/dist/esm');
const load = (sub) => import(pathToFileURL(path.join(SDK, sub)).href);
const { Client } = await load('client/index.js');
const { StdioClientTransport } = await load('client/stdio.js');
const { StreamableHTTPClientTransport } = await load('client/streamableHttp.js');

function fail(message) {
    process.stderr.write(`driver failed: ${message}\n`);
    process.exit(1);
}

function parseArgs(argv) {
    const opts = { calls: 300, warmup: 30, url: null, cmd: [] };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (a === '--') { opts.cmd = argv.slice(i + 1); break; }
        else if (a === '--calls') opts.calls = Number(argv[++i]);
        else if (a === '--warmup') opts.warmup = Number(argv[++i]);
        else if (a === '--url') opts.url = argv[++i];
        else fail(`unknown argument ${a}`);
    }
    if (!opts.url === !opts.cmd.length) fail('give exactly one of --url URL or -- CMD...');
    return opts;
}

async function call(client, code) {
    const r = await client.callTool({ name: 'python_exec', arguments: { code } });
    if (r.isError) fail(`python_exec ${JSON.stringify(code)}: ${JSON.stringify(r.content)}`);
}

const opts = parseArgs(process.argv.slice(2));
const start = performance.now();
const transport = opts.url
    ? new StreamableHTTPClientTransport(new URL(opts.url))
    // The SDK passes the child only a few variables unless told; the server needs ours.
    : new StdioClientTransport({ command: opts.cmd[0], args: opts.cmd.slice(1), env: { ...process.env } });
const client = new Client({ name: 'ferrepl-bench-ts', version: '0' });
await client.connect(transport);
await call(client, 'x = 0');
const connectMs = performance.now() - start;
for (let i = 0; i < opts.warmup; i++) await call(client, 'x = x + 1');
const ms = [];
for (let i = 0; i < opts.calls; i++) {
    const t = performance.now();
    await call(client, 'x = x + 1');
    ms.push(performance.now() - t);
}
if (opts.url) await transport.terminateSession();
await client.close();

ms.sort((a, b) => a - b);
const mid = ms.length >> 1;
const median = ms.length % 2 ? ms[mid] : (ms[mid - 1] + ms[mid]) / 2;
const round = (x, d) => Math.round(x * 10 ** d) / 10 ** d;
console.log(JSON.stringify({
    client: 'ts_sdk',
    transport: opts.url ? 'http' : 'stdio',
    median_ms: round(median, 4),
    p99_ms: round(ms[Math.ceil(0.99 * ms.length) - 1], 4),
    calls: ms.length,
    connect_ms: round(connectMs, 3),
}));
