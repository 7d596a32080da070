// The SDK and the server share one contract, the server's OpenAPI document: every request the
// SDK sends (a sweep over every method, plus what the other test files sent, recorded in
// LIZARD_SDK_TEST_RECORD_DIR) must name a path and method the document has, with query
// parameters and JSON fields the document declares.
//
// A request the document lacks fails the test: nothing is waived.

import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Lizard, Sandbox, APIError } from '../src/index.js'
import { server, openapi, myProject, SENT } from './helpers.js'

const escape = (s) => s.replace(/[.*+?^$()|[\]\\]/g, '\\$&')
const pattern = (template) => new RegExp(`^${escape(template).replace(/\{[^}]+\}/g, '[^/]+')}$`)

function resolve(doc, schema) {
  while (schema?.$ref) schema = doc.components.schemas[schema.$ref.split('/').pop()]
  return schema ?? {}
}

/** The field names an object schema allows; null when it does not restrict them. */
function properties(doc, schema) {
  schema = resolve(doc, schema)
  for (const combo of ['allOf', 'oneOf', 'anyOf']) {
    if (schema[combo]) {
      const names = new Set()
      for (const part of schema[combo]) {
        const p = properties(doc, part)
        if (p === null) return null
        for (const n of p) names.add(n)
      }
      return names
    }
  }
  return schema.properties ? new Set(Object.keys(schema.properties)) : null
}

export function violations(doc, sent) {
  const templates = Object.keys(doc.paths).map((t) => [t, pattern(t)])
  const bad = []
  for (const { method, path: p, query, json } of sent) {
    const ops = templates
      .filter(([, rx]) => rx.test(p))
      .map(([t]) => t)
      .sort((a, b) => a.split('{').length - b.split('{').length) // a literal segment wins
      .map((t) => [t, doc.paths[t][method.toLowerCase()]])
      .filter(([, op]) => op)
    if (!ops.length) {
      bad.push(`${method} ${p}: no such operation in the OpenAPI document`)
      continue
    }
    const [template, op] = ops[0]
    const declared = new Set(
      [...(op.parameters ?? []), ...(doc.paths[template].parameters ?? [])].filter((x) => x.in === 'query').map((x) => x.name),
    )
    for (const name of Object.keys(query ?? {})) {
      if (!declared.has(name)) bad.push(`${method} ${template}: query parameter '${name}' is not in the document`)
    }
    if (json && typeof json === 'object') {
      const schema = op.requestBody?.content?.['application/json']?.schema
      if (!schema) {
        bad.push(`${method} ${template}: sends a JSON body the document does not take`)
        continue
      }
      const allowed = properties(doc, schema)
      if (allowed) {
        for (const field of Object.keys(json)) {
          if (!allowed.has(field)) bad.push(`${method} ${template}: field '${field}' is not in the document (${[...allowed]})`)
        }
      }
    }
  }
  return bad
}

/**
 * Two directories whose push the server refuses after the uploads (a recipe with a bad name,
 * a Dockerfile FROM an image), each with a file the server has not seen.
 */
function pushDirs() {
  const [tomlDir, dockerDir] = [0, 1].map(() => fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-contract-')))
  fs.writeFileSync(path.join(tomlDir, 'lizard.template.toml'), 'name = "Not_A_Name"\nfrom = "base"\n')
  fs.writeFileSync(path.join(dockerDir, 'Dockerfile'), 'FROM python:3.12\nRUN true\n')
  for (const d of [tomlDir, dockerDir]) fs.writeFileSync(path.join(d, 'fresh.txt'), randomUUID())
  return [tomlDir, dockerDir]
}

/** Call every method of the SDK once (ids need not exist: only the requests matter). */
async function sweep() {
  const lz = new Lizard({ project: 'my-project' })
  const [tomlDir, dockerDir] = pushDirs()
  const sb = new Sandbox({ sandboxId: 'sb_contract', domain: 'd' }, lz.platform)
  const calls = [
    () => lz.whoami(),
    () => lz.list(),
    () => lz.connect('sb_contract'),
    () => Sandbox.list({ projectId: 'p', workspaceId: 'w' }),
    () =>
      Sandbox.create('nope', {
        project: 'no-such',
        timeoutMs: 1,
        envs: { A: '1' },
        metadata: { m: '1' },
        lizardToken: 'lz_x',
        vcpus: 1,
        memoryMib: 128,
      }),
    () => Sandbox.create('nope', { projectId: 'no-such', volumeName: 'v', onTimeout: 'kill' }),
    () => sb.getInfo(),
    () => sb.setTimeout(1000),
    () => sb.kill(),
    () => sb.pause(),
    () => sb.resume(),
    () => sb.fork(2),
    () => sb.listPorts(),
    () => sb.fs.write('/x', 'y', { mode: 0o644 }),
    () => sb.fs.read('/x'),
    () => sb.fs.list('/'),
    () => sb.fs.remove('/x'),
    () => sb.fs.makeDir('/x'),
    () => sb.process.exec('true', { cwd: '/', envs: { A: 'b' }, user: 'root', timeoutMs: 1000, stdin: 'x' }),
    () => sb.process.exec(['true']),
    () => sb.process.exec('true', { onStdout: console.log }),
    () => lz.workspaces.list(),
    () => lz.workspaces.create({ name: '' }),
    () => lz.workspaces.find('nope'),
    () => lz.workspaces.delete('nope', { force: true }),
    () => lz.projects.list({ workspaceId: 'nope' }),
    () => lz.projects.get('nope'),
    () => lz.projects.create({ workspaceId: 'nope', name: 'x' }),
    () => lz.projects.update('nope', { name: 'x' }),
    () => lz.projects.delete('nope'),
    () => lz.apiKeys.list(),
    () => lz.apiKeys.create({ name: 'x', workspaces: ['nope'], projects: ['nope'] }),
    () => lz.apiKeys.delete('nope'),
    () => lz.regions.list(),
    () => lz.volumes.create('contract-vol', { sizeGb: 1, region: 'nowhere' }),
    () => lz.volumes.get('contract-vol'),
    () => lz.volumes.list(),
    () => lz.volumes.delete('contract-vol'),
    () => lz.billing.balance(),
    () => lz.billing.transactions({ limit: 1, cursor: 'c', includeUsage: true }),
    () => lz.billing.summary({ granularity: 'day', periods: 2 }),
    () => lz.billing.live(),
    () => lz.metrics.get({ workspaceId: 'w', projectId: 'p', from: '2026-01-01T00:00:00Z', to: '2026-01-02T00:00:00Z' }),
    () => lz.templates.list(),
    () => lz.templates.list({ workspace: 'sdk-examples' }),
    () => lz.templates.get('nope'),
    () => lz.templates.delete('nope', { workspace: 'sdk-examples' }),
    () => lz.templates.getBuild('nope', 'bld_x'),
    () => lz.templates.cancelBuild('nope', 'bld_x'),
    async () => {
      for await (const _ of lz.templates.events('nope', 'bld_x'));
    },
    () => lz.templates.push(tomlDir),
    () => lz.templates.push(dockerDir, { name: 'contract', workspace: 'sdk-examples' }),
    () => new Lizard().templates.list(),
  ]
  for (const call of calls) {
    try {
      await call()
    } catch (e) {
      if (!(e instanceof APIError)) throw e
    }
  }
  for (const d of [tomlDir, dockerDir]) fs.rmSync(d, { recursive: true, force: true })
}

let doc
before(async () => {
  await server()
  await myProject()
  doc = await openapi()
})

test('every request the SDK sends is in the OpenAPI document', async () => {
  await sweep()
  const sent = [...SENT]
  const dir = process.env.LIZARD_SDK_TEST_RECORD_DIR
  if (dir) {
    for (const f of fs.readdirSync(dir)) sent.push(...JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')))
  }
  const mine = sent.filter((r) => r.apiUrl === process.env.LIZARD_API_URL)
  assert.ok(mine.length >= 40)
  const bad = violations(doc, mine)
  assert.deepEqual([...new Set(bad)].sort(), [])
})

test('the check catches an unknown path, method, query parameter or field', () => {
  const one = (method, p, query, json) => violations(doc, [{ method, path: p, query, json }])
  assert.ok(one('POST', '/v1/workspaces', {}, { name: 'a', colour: 'red' }).some((b) => b.includes('colour')))
  assert.ok(one('GET', '/v1/no-such-thing', {}).length)
  assert.ok(one('GET', '/v1/sandboxes', { sort: 'x' }).some((b) => b.includes('sort')))
  assert.ok(one('PATCH', '/v1/regions', {}).length)
  assert.deepEqual(one('GET', '/v1/sandboxes/sb_1/files/list', { path: '/' }), [])
})
