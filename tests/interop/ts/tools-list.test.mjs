// Proves that the official TypeScript SDK accepts ferrepl's tool list silently:
// connecting and listing tools over stdio prints no warning (no console.warn /
// console.error, no process 'warning' event; the SDK's Ajv complains there
// about schema keywords it does not know, such as format "uint64"), for the
// default tool profile, for `--tools all`, and with `--structured-content`,
// where a python_exec result's structuredContent passes the SDK's own
// validation against the tool's outputSchema.

import assert from 'node:assert/strict';
import test from 'node:test';
import { call, stdioClient, text } from './harness.mjs';

const DEFAULT_TOOLS = ['python_exec', 'python_wait', 'python_output', 'python_sessions', 'python_inspect', 'python_install'];
const ALL_TOOLS = [
    ...DEFAULT_TOOLS,
    'python_history', 'python_run_file', 'python_complete', 'python_namespace',
    'shell_exec', 'shell_wait', 'shell_output',
    'file_list', 'file_read', 'file_write', 'file_delete',
];

/** Runs `fn` and returns what it printed through console.warn/error or emitted as process warnings. */
async function captureWarnings(fn) {
    const seen = [];
    const { warn, error } = console;
    const onWarning = (w) => seen.push(`process warning: ${w.name}: ${w.message}`);
    console.warn = (...args) => seen.push(`console.warn: ${args.join(' ')}`);
    console.error = (...args) => seen.push(`console.error: ${args.join(' ')}`);
    process.on('warning', onWarning);
    try {
        await fn();
        // A 'warning' event is emitted on the next tick: let it arrive.
        await new Promise((r) => setImmediate(r));
    } finally {
        console.warn = warn;
        console.error = error;
        process.off('warning', onWarning);
    }
    return seen;
}

async function connectAndList(t, args) {
    let server, tools;
    const warnings = await captureWarnings(async () => {
        server = await stdioClient(t, args);
        ({ tools } = await server.client.listTools());
    });
    assert.deepEqual([...new Set(warnings)], [], `the SDK printed warnings during connect + listTools (server ${args.join(' ')})`);
    return { client: server.client, tools, names: tools.map((tool) => tool.name) };
}

// The tests of this file patch the global console, so they run one at a time.

test('default profile: listTools prints no warning and lists the python tools', async (t) => {
    const { client, tools, names } = await connectAndList(t, []);
    assert.deepEqual([...names].sort(), [...DEFAULT_TOOLS].sort());
    for (const tool of tools) assert.equal(tool.outputSchema, undefined, `${tool.name} has an outputSchema without --structured-content`);
    // Text only by default: no structuredContent on a result.
    const result = await call(client, 'python_exec', { code: '1+1' });
    assert.match(text(result), /^2$/m);
    assert.match(text(result), /-- ok \|/);
    assert.equal(result.structuredContent, undefined);
});

test('--tools all: listTools prints no warning and lists every group', async (t) => {
    const { names } = await connectAndList(t, ['--tools', 'all']);
    for (const name of ALL_TOOLS) assert.ok(names.includes(name), `${name} missing from ${names.join(', ')}`);
});

test('--tools all --structured-content: no warning, and python_exec structuredContent validates', async (t) => {
    const { client, tools, names } = await connectAndList(t, ['--tools', 'all', '--structured-content']);
    for (const name of ALL_TOOLS) assert.ok(names.includes(name), `${name} missing from ${names.join(', ')}`);
    const exec = tools.find((tool) => tool.name === 'python_exec');
    assert.equal(exec.outputSchema?.type, 'object', 'python_exec carries an outputSchema');
    // The SDK validates structuredContent against the outputSchema itself and
    // throws if it does not match; compiling the schema must not warn either.
    let result;
    const warnings = await captureWarnings(async () => {
        result = await call(client, 'python_exec', { code: '1+1' });
    });
    assert.deepEqual([...new Set(warnings)], []);
    assert.notEqual(result.isError, true);
    assert.equal(result.structuredContent?.status, 'ok', JSON.stringify(result.structuredContent));
    assert.match(text(result), /-- ok \|/);
});
