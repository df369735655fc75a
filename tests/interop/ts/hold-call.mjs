// Client A of reconnect.test.mjs, run as its own process so the test can
// SIGKILL it mid-call: connects to the streamable HTTP URL in argv[2], prints
// "connected", then calls python_exec with the arguments (JSON) in argv[3].
// Not a test file (no .test. in its name): node --test does not run it.

import { Client, StreamableHTTPClientTransport } from './harness.mjs';

const [url, args] = process.argv.slice(2);
const client = new Client({ name: 'ferrepl-ts-interop-a', version: '0.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
process.stdout.write('connected\n');
const result = await client.callTool({ name: 'python_exec', arguments: JSON.parse(args) });
process.stdout.write(`${JSON.stringify(result)}\n`);
await client.close();
