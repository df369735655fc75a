// Shared helpers for the TypeScript-SDK interop tests (run by scripts/ts-interop.sh).
//
// Finds the ferrepl binary ($FERREPL_BIN, else target/debug/ferrepl) and the
// test environment ($FERREPL_TEST_ENV, else target/test-env, made by
// scripts/test-env.sh), loads the official TypeScript SDK from there, and
// starts ferrepl over stdio or streamable HTTP, each on a fresh temp --workdir.
// Everything a helper starts is stopped after the test, last started first.
// A missing binary or package throws at import time: the tests fail, never skip.

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const BIN = process.env.FERREPL_BIN || path.join(ROOT, 'target/debug/ferrepl');
export const ENV_DIR = process.env.FERREPL_TEST_ENV || path.join(ROOT, 'target/test-env');
export const NODE_MODULES = path.join(ENV_DIR, 'node/node_modules');

if (!existsSync(BIN)) {
    throw new Error(`no ferrepl binary at ${BIN}: run cargo build, or set FERREPL_BIN`);
}

/** Absolute path of an installed package's directory; throws if it is missing. */
export function packageDir(name) {
    const dir = path.join(NODE_MODULES, name);
    if (!existsSync(path.join(dir, 'package.json'))) {
        throw new Error(`package ${name} is not installed in ${NODE_MODULES}: run scripts/test-env.sh`);
    }
    return dir;
}

// The SDK lives outside this tree, so bare imports cannot find it: import its
// ESM entry points by path, as its package.json "exports" map declares them.
const SDK_DIR = packageDir('@modelcontextprotocol/sdk');
export const SDK_VERSION = JSON.parse(readFileSync(path.join(SDK_DIR, 'package.json'), 'utf8')).version;
async function sdk(subpath) {
    return import(pathToFileURL(path.join(SDK_DIR, 'dist/esm', subpath)).href);
}
export const { Client } = await sdk('client/index.js');
export const { StdioClientTransport } = await sdk('client/stdio.js');
export const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');

// t.after hooks run in the order they were registered; cleanups must run the
// other way round (stop a server before removing its workdir): one stack per test.
const cleanups = new WeakMap();
/** Runs `fn` after the test, before the cleanups registered earlier. */
export function defer(t, fn) {
    let stack = cleanups.get(t);
    if (!stack) {
        stack = [];
        cleanups.set(t, stack);
        t.after(async () => {
            let first = null;
            while (stack.length) {
                try {
                    await stack.pop()();
                } catch (err) {
                    first ??= err;
                }
            }
            if (first) throw first;
        });
    }
    stack.push(fn);
}

/** A fresh temporary directory, removed after the test. */
export function tempDir(t, prefix = 'ferrepl-ts-') {
    const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
    defer(t, () => rmSync(dir, { recursive: true, force: true }));
    return dir;
}

/**
 * `--workdir DIR --state-dir STATE`, both fresh temporary directories: every
 * server keeps its sessions in a state directory of its test's own, never in
 * the user's ~/.local/state/ferrepl. Returns { workdir, args }.
 */
export function serverDirs(t) {
    const workdir = tempDir(t);
    const state = tempDir(t, 'ferrepl-ts-state-');
    return { workdir, args: ['--workdir', workdir, '--state-dir', state] };
}

const CLIENT_INFO = { name: 'ferrepl-ts-interop', version: '0.0.0' };

/**
 * ferrepl over stdio (StdioClientTransport spawns it), connected.
 * Returns { client, workdir, stderr() }; closing the client stops the server.
 */
export async function stdioClient(t, args = []) {
    const { workdir, args: dirs } = serverDirs(t);
    const transport = new StdioClientTransport({ command: BIN, args: [...dirs, ...args], stderr: 'pipe' });
    let log = '';
    transport.stderr?.on('data', (chunk) => { log += chunk; });
    const client = new Client(CLIENT_INFO);
    defer(t, () => client.close());
    await client.connect(transport);
    return { client, workdir, stderr: () => log };
}

export const delay = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * `ferrepl --http 127.0.0.1:0 --workdir DIR` as a child process, ready once it
 * logs the address it listens on (the kernel picks the port, so no other
 * process can take it first). Returns { url, workdir, stderr() }; the server
 * is stopped when the test ends.
 */
export async function httpServer(t, args = []) {
    const { workdir, args: dirs } = serverDirs(t);
    const proc = spawn(BIN, ['--http', '127.0.0.1:0', ...dirs, ...args], {
        stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
    let gone = null;
    exited.then((how) => { gone = how; });
    defer(t, async () => {
        if (gone) return;
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(timer);
    });
    const listening = /listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/;
    const url = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`ferrepl did not log 'listening on' within 30 s; its stderr:\n${log}`)), 30_000);
        let found = null;
        proc.stderr.on('data', (chunk) => {
            log += chunk;
            if (found) return;
            found = listening.exec(log);
            if (found) { clearTimeout(timer); resolve(found[1]); }
        });
        exited.then((how) => {
            clearTimeout(timer);
            reject(new Error(`ferrepl exited before listening (${JSON.stringify(how)}); its stderr:\n${log}`));
        });
    });
    return { url, workdir, stderr: () => log };
}

/** A new client (its own transport session) connected to an HTTP server's URL. */
export async function httpClient(t, url) {
    const client = new Client(CLIENT_INFO);
    defer(t, () => client.close());
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    return client;
}

/** The text blocks of a tool result, joined. */
export function text(result) {
    return (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

/** The status word of a cell result's footer line (`-- ok | cell 3 | ... --`), or null. */
export function footerStatus(result) {
    const m = text(result).match(/^-- (ok|error|running|waiting_input|interrupted|crashed) \|.*--\s*$/m);
    return m ? m[1] : null;
}

export function call(client, name, args = {}, options = undefined) {
    return client.callTool({ name, arguments: args }, undefined, options);
}

/**
 * Calls python_wait (with `args`) again and again while the cell is still
 * running, at most `maxCalls` times; returns the last result.
 */
export async function waitWhileRunning(client, args = {}, maxCalls = 10) {
    let result;
    for (let i = 0; i < maxCalls; i++) {
        result = await call(client, 'python_wait', args);
        if (footerStatus(result) !== 'running') return result;
    }
    throw new Error(`cell still running after ${maxCalls} python_wait calls; last result:\n${text(result)}`);
}
