// MCP Tasks (io.modelcontextprotocol/tasks, SEP-2663) through the official
// requester, @modelcontextprotocol/ext-tasks (installed with the Inspector),
// on the TypeScript SDK's v2 client. A call becomes a task only when the
// request's own _meta declares the extension (protocol 2026-07-28).
//
// Pinned to 2026-07-28 over streamable HTTP (a Tasks server of that protocol
// needs the host's raw request path, `rawDispatch`: one POST per request, as
// the stateless protocol has it, beside the SDK client), it proves: a long
// cell becomes a task that settles with the cell's result; a quick cell is
// answered at once; cancelling the task interrupts the cell and keeps the
// session; a shell job runs as a task; a task handed off by one client is
// resumed and collected by another.
//
// In the legacy era (the `initialize` handshake; the client declares the
// extension there, but its requests carry no capabilities of their own), a
// long cell over HTTP and over stdio is answered at once with `running`,
// which ext-tasks decodes as an immediate result (ext-tasks 0.2.2 threw a
// ProtocolDecodeError on the task ferrepl used to send), and python_wait
// follows the cell to its end. A 2026-07-28 client that does not declare
// the extension gets `running` too.

import assert from 'node:assert/strict';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, test } from 'node:test';
import { BIN, defer, httpServer, packageDir, serverDirs } from './harness.mjs';

const load = (pkg, file) => import(pathToFileURL(path.join(packageDir(pkg), file)).href);
const { Client, StreamableHTTPClientTransport } = await load('@modelcontextprotocol/client', 'dist/index.mjs');
const { StdioClientTransport } = await load('@modelcontextprotocol/client', 'dist/stdio.mjs');
const { createTaskSessionFromClient, resultFromTaskOutcome } = await load(
    '@modelcontextprotocol/ext-tasks',
    'dist/client/index.js',
);

const PROTOCOL = '2026-07-28';
const INFO = { name: 'ferrepl-ts-tasks', version: '0.0.0' };
const CAPABILITIES = { extensions: { 'io.modelcontextprotocol/tasks': {} } };

/** One request as its own POST (the 2026-07-28 framing is the requester's). */
function rawDispatch(url) {
    let id = 1_000_000;
    return async (request, options = {}) => {
        const headers = {
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            'mcp-protocol-version': PROTOCOL,
            'mcp-method': request.method,
            ...(options.context?.headers ?? {}),
        };
        const name = request.params?.taskId ?? request.params?.name;
        if (name && !Object.keys(headers).some((k) => k.toLowerCase() === 'mcp-name')) headers['mcp-name'] = name;
        const body = JSON.stringify({ jsonrpc: '2.0', id: id++, ...request });
        const res = await fetch(url, { method: 'POST', headers, body, signal: options.signal });
        const text = await res.text();
        const line = text.split('\n').map((l) => l.replace(/^data: /, '')).find((l) => l.startsWith('{'));
        if (!line) throw new Error(`no JSON-RPC answer to ${request.method} (HTTP ${res.status}): ${text}`);
        const message = JSON.parse(line);
        return message.error ? { kind: 'error', error: message.error } : { kind: 'result', result: message.result };
    };
}

/** A task-enabled session on a new v2 client, closed after the test. */
async function tasksSession(t, url) {
    const client = new Client(INFO, { capabilities: CAPABILITIES, versionNegotiation: { mode: { pin: PROTOCOL } } });
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    assert.equal(client.getProtocolEra(), 'modern');
    const session = createTaskSessionFromClient(client, {
        endpointId: url,
        rawDispatch: rawDispatch(url),
        v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo: INFO, clientCapabilities: CAPABILITIES },
    });
    defer(t, async () => {
        await session.close();
        await client.close();
    });
    session.client = client;
    return session;
}

/**
 * An ext-tasks session on a new v2 client in the legacy era (the SDK's
 * default: `initialize`, no `server/discover`), the extension declared at
 * initialize; over HTTP to `url`, or over stdio (a server of its own).
 */
async function legacySession(t, url) {
    const client = new Client(INFO, { capabilities: CAPABILITIES });
    let transport;
    if (url) {
        transport = new StreamableHTTPClientTransport(new URL(url));
    } else {
        const { args } = serverDirs(t);
        transport = new StdioClientTransport({ command: BIN, args, stderr: 'pipe' });
        transport.stderr?.resume(); // drained, so that the server never blocks on it
    }
    await client.connect(transport);
    assert.equal(client.getProtocolEra(), 'legacy');
    assert.ok(
        client.getServerCapabilities()?.extensions?.['io.modelcontextprotocol/tasks'],
        'the server declares the extension',
    );
    const session = createTaskSessionFromClient(client, { endpointId: url ?? 'stdio' });
    defer(t, async () => {
        await session.close();
        await client.close();
    });
    return session;
}

const text = (result) => (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
const status = (result) => text(result).match(/^-- (\w+) \|.*--\s*$/m)?.[1] ?? null;

/** The result of a call answered at once. */
async function immediate(session, name, args) {
    const execution = await session.callTool(name, args);
    assert.equal(execution.kind, 'immediate', `${name} became a task`);
    return resultFromTaskOutcome((await execution.settle()).outcome);
}

describe('MCP Tasks through @modelcontextprotocol/ext-tasks', () => {
    test('a long cell is a task that settles with its result; a quick one is answered at once', async (t) => {
        const { url } = await httpServer(t);
        const session = await tasksSession(t, url);
        // The first cell also starts the interpreter (and makes the kept
        // venv): a window that a loaded CI machine cannot miss.
        assert.equal(status(await immediate(session, 'python_exec', { code: '1+1', wait_s: 45 })), 'ok');

        const code = "import time\nprint('start')\ntime.sleep(2.5)\nprint('end')\n6*7";
        const execution = await session.callTool('python_exec', { code, wait_s: 0.3 });
        assert.equal(execution.kind, 'task');
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
        const result = resultFromTaskOutcome(outcome);
        assert.equal(status(result), 'ok', text(result));
        assert.match(text(result), /^start\nend\n42\n-- ok \| cell \d+ \| session default \|/);
    });

    test('cancelling the task interrupts the cell and the session keeps its variables', async (t) => {
        const { url } = await httpServer(t);
        const session = await tasksSession(t, url);
        await immediate(session, 'python_exec', { code: 'kept = 41' });
        const execution = await session.callTool('python_exec', {
            code: "import time\nprint('looping')\nwhile True: time.sleep(0.05)",
            wait_s: 0.3,
        });
        assert.equal(execution.kind, 'task');
        await execution.cancel();
        const { outcome } = await execution.settle();
        assert.equal(outcome.status, 'cancelled', JSON.stringify(outcome));
        const interrupted = await immediate(session, 'python_wait', { wait_s: 10 });
        assert.equal(status(interrupted), 'interrupted', text(interrupted));
        assert.match(text(await immediate(session, 'python_exec', { code: 'kept + 1' })), /^42$/m);
    });

    test('a shell job runs as a task', async (t) => {
        const { url } = await httpServer(t, ['--tools', 'all']);
        const session = await tasksSession(t, url);
        const execution = await session.callTool('shell_exec', { command: 'echo begun; sleep 2; echo over', wait_s: 0.2 });
        assert.equal(execution.kind, 'task');
        const result = resultFromTaskOutcome((await execution.settle()).outcome);
        assert.match(text(result), /begun\nover\n/);
        assert.match(text(result), /-- exit 0 \| job j\d+ \|/);
    });

    test('a task handed off by one client is resumed by another', async (t) => {
        const { url } = await httpServer(t);
        const first = await tasksSession(t, url);
        const code = "import time\ntime.sleep(2)\nprint('collected elsewhere')";
        const execution = await first.callTool('python_exec', { code, wait_s: 0.2 });
        assert.equal(execution.kind, 'task');
        let reference;
        await execution.handoff((r) => { reference = r; });
        // The connection goes (closing the session would cancel its tasks).
        await first.client.close();

        const second = await tasksSession(t, url);
        const resumed = await second.resumeTask(reference);
        const result = resultFromTaskOutcome((await resumed.settle()).outcome);
        assert.equal(status(result), 'ok', text(result));
        assert.match(text(result), /collected elsewhere/);
    });

    for (const transport of ['http', 'stdio']) {
        test(`legacy era over ${transport}: the extension declared at initialize gives running, never a task`, async (t) => {
            const url = transport === 'http' ? (await httpServer(t)).url : undefined;
            const session = await legacySession(t, url);
            const code = "import time\nprint('begun')\ntime.sleep(3)\nprint('over')\n'legacy done'";
            const execution = await session.callTool('python_exec', { code, wait_s: 1 });
            assert.equal(execution.kind, 'immediate', 'a legacy connection was given a task');
            const running = resultFromTaskOutcome((await execution.settle()).outcome);
            assert.ok(Array.isArray(running.content) && running.content.length > 0, JSON.stringify(running));
            assert.notEqual(running.isError, true, text(running));
            assert.equal(status(running), 'running', text(running));
            assert.match(text(running), /python_wait/);
            let done = await immediate(session, 'python_wait', { wait_s: 10 });
            for (let i = 0; i < 5 && status(done) === 'running'; i++) {
                done = await immediate(session, 'python_wait', { wait_s: 10 });
            }
            assert.equal(status(done), 'ok', text(done));
            assert.match(text(done), /^over\n'legacy done'\n-- ok \| cell 1 \|/m);
        });
    }

    test('a 2026-07-28 client that does not declare the extension gets running', async (t) => {
        const { url } = await httpServer(t);
        const client = new Client(INFO, { versionNegotiation: { mode: { pin: PROTOCOL } } });
        await client.connect(new StreamableHTTPClientTransport(new URL(url)));
        defer(t, () => client.close());
        assert.equal(client.getProtocolEra(), 'modern');
        const code = "import time\ntime.sleep(3)\n'modern done'";
        const running = await client.callTool({ name: 'python_exec', arguments: { code, wait_s: 1 } });
        assert.equal(running.resultType ?? 'complete', 'complete', JSON.stringify(running));
        assert.equal(status(running), 'running', text(running));
        let done = await client.callTool({ name: 'python_wait', arguments: { wait_s: 10 } });
        for (let i = 0; i < 5 && status(done) === 'running'; i++) {
            done = await client.callTool({ name: 'python_wait', arguments: { wait_s: 10 } });
        }
        assert.equal(status(done), 'ok', text(done));
        assert.match(text(done), /'modern done'/);
    });
});
