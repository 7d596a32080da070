// E2B's Template SDK from npm (`e2b`, unchanged) against a real `lizard server`: a build
// with files, commands and a start command on Lizard's builder, a background build
// followed by its status, sandboxes from the result, `Template.exists`.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { forgetE2bEnv, scopedE2bEnv } from './setup.mjs'

let workspace
let e2b

before(async () => {
  workspace = await scopedE2bEnv('e2b-js-tpl')
  e2b = await import('e2b')
})

after(() => forgetE2bEnv(workspace))

test('Template.build and a background build make templates sandboxes start from', async () => {
  const context = mkdtempSync(join(tmpdir(), 'e2b-js-tpl-'))
  mkdirSync(join(context, 'site'))
  writeFileSync(join(context, 'site', 'index.html'), 'served from a template\n')
  const name = `e2b-js-${randomBytes(3).toString('hex')}`
  const template = e2b.Template({ fileContextPath: context })
    .fromTemplate('base')
    .copy('site', '/home/user/site')
    .setEnvs({ FROM_JS: 'yes' })
    .runCmd('echo "$FROM_JS" > /home/user/env.txt')
    .setWorkdir('/home/user/site')
    .setStartCmd('python3 -m http.server 8000', e2b.waitForPort(8000))
  const logs = []
  const built = await e2b.Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) })
  assert.equal(built.templateId, name)
  assert.ok(logs.some((m) => m.endsWith(`Template ${name} is ready`)), logs.join('\n'))
  assert.equal(await e2b.Template.exists(name), true)

  const sbx = await e2b.Sandbox.create(name)
  try {
    const run = async (cmd) => (await sbx.commands.run(cmd)).stdout
    assert.equal(await run('cat /home/user/env.txt'), 'yes\n')
    assert.equal(await run('pwd'), '/home/user/site\n')
    assert.equal(await run('curl -s http://127.0.0.1:8000/index.html'), 'served from a template\n')
  } finally {
    await sbx.kill()
  }

  // In the background, followed by its status: the same template, one step changed.
  const again = e2b.Template().fromTemplate(name).runCmd('echo second > /home/user/second.txt')
  const second = `${name}-2`
  const info = await e2b.Template.buildInBackground(again, second)
  let status
  for (let i = 0; i < 600; i++) {
    status = await e2b.Template.getBuildStatus(info)
    if (status.status !== 'building' && status.status !== 'waiting') break
    await new Promise((r) => setTimeout(r, 500))
  }
  assert.equal(status.status, 'ready', JSON.stringify(status))
  const child = await e2b.Sandbox.create(second)
  try {
    assert.equal((await child.commands.run('cat /home/user/second.txt /home/user/env.txt')).stdout, 'second\nyes\n')
  } finally {
    await child.kill()
  }
  assert.equal(await e2b.Template.exists(`${name}-none`), false)
})
