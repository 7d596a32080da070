// The reference's TypeScript examples, type-checked against src/index.d.ts
// (`npm run typecheck`; not executed: the .test.js files run them against a server).
import {
  Lizard,
  Sandbox,
  NotFoundError,
  PermissionDeniedError,
  BuildError,
  type ProcessResult,
  type BuildEvent,
} from '@lizard-build/sdk'

declare const process: { env: Record<string, string | undefined> }
declare const userId: string
declare const db: { users: { update(id: string, fields: { lizardKey: string }): Promise<void> } }

export async function quickstart(): Promise<void> {
  const lizard = new Lizard({ project: 'my-project' })
  const sandbox = await lizard.create('base')
  await sandbox.fs.write('/app/server.js', `
const http = require('http')
http.createServer((_, res) => res.end('hello from Lizard')).listen(3000)
`)
  await sandbox.process.exec('node /app/server.js &')
  const url = sandbox.getHost(3000)
  console.log(`Live at https://${url}`)
  await sandbox.kill()
}

export async function volumes(lizard: Lizard): Promise<void> {
  const vol = await lizard.volumes.getOrCreate('agent-scratch', { sizeGb: 10 })
  const first = await lizard.create('codex', { volumeName: 'agent-scratch' })
  await first.process.exec('pip install numpy pandas && echo "notes" > /workspace/notes.txt')
  await first.kill() // sandbox gone, /workspace survives
  const second = await lizard.create('codex', { volumeName: 'agent-scratch' })
  console.log(await second.fs.read('/workspace/notes.txt')) // "notes"
  const id: string = vol.id
  void id
}

export async function perUser(): Promise<void> {
  const lizard = new Lizard({ apiKey: process.env.LIZARD_API_KEY })
  const ws = await lizard.workspaces.create({ name: `user-${userId}` })
  const prj = await lizard.projects.create({ workspaceId: ws.id, name: 'default' })
  const key = await lizard.apiKeys.create({ name: `user-${userId}`, workspaces: [ws.id] })
  await db.users.update(userId, { lizardKey: key.key })
  const sandbox = await Sandbox.create('codex', {
    projectId: prj.id,
    lizardToken: key.key, // scoped — bounded if it leaks
  })
  const r: ProcessResult = await sandbox.process.exec('lizard volume list')
  const code: number = r.exitCode
  void code
}

export async function clientAndCreate(): Promise<void> {
  const lizard = new Lizard({ project: 'my-project' })
  const a = await lizard.create('base')
  const b = await lizard.create('code-interpreter-v1', { timeoutMs: 10 * 60 * 1000 })
  const c = await Sandbox.create('base', { project: 'my-project' })
  const d = await Sandbox.create('code-interpreter-v1', { project: 'my-project', timeoutMs: 10 * 60 * 1000 })
  await sandboxApi(a)
  for (const s of [a, b, c, d]) await s.kill()
  await lizard.workspaces.delete('ws', { force: true })
  await lizard.projects.list({ workspaceId: 'ws' })
  await lizard.projects.update('p', { name: 'n' })
  await lizard.billing.transactions({ limit: 10, includeUsage: true })
  const me = await lizard.whoami()
  const scoped: boolean = me.scoped
  void scoped
  try {
    await Sandbox.connect('sb_x')
  } catch (e) {
    if (e instanceof NotFoundError || e instanceof PermissionDeniedError) console.log(e.code, e.status)
  }
  const raw = await lizard.platform.get<{ id: string }[]>('/v1/regions')
  void raw
}

async function sandboxApi(sandbox: Sandbox): Promise<void> {
  await sandbox.process.exec('npx -y serve -p 3000 &')
  const url: string = sandbox.getHost(3000)
  await sandbox.fs.makeDir('/a/b')
  const entries = await sandbox.fs.list('/a')
  const name: string = entries[0].name
  await sandbox.fs.remove('/a')
  await sandbox.setTimeout(60_000)
  await sandbox.pause()
  await sandbox.resume()
  const [copy] = await sandbox.fork(1)
  void [url, name, copy]
}

// Templates as code: push a directory, follow its build, create from it.
export async function templates(lizard: Lizard): Promise<void> {
  const steps: string[] = []
  try {
    const build = await lizard.templates.push('./my-agent', {
      onEvent: (e: BuildEvent) => {
        if (e.type === 'step') steps.push(`${e.index}/${e.total} ${e.description}${e.cached ? ' (cached)' : ''}`)
        else if (e.type === 'output') process.env.VERBOSE && console.log(e.data)
      },
    })
    const cached: number = build.steps.filter((s) => s.cached).length
    void cached
  } catch (e) {
    if (e instanceof BuildError) console.log(e.code, e.step, e.outputTail)
    throw e
  }
  for (const t of await lizard.templates.list()) console.log(t.name, t.builtin, t.ready)
  const info = await lizard.templates.get('my-agent')
  if (info.latestBuildId) {
    for await (const e of lizard.templates.events('my-agent', info.latestBuildId)) if (e.type === 'done') console.log(e.status)
    const b = await lizard.templates.getBuild('my-agent', info.latestBuildId)
    console.log(b.status, b.log)
  }
  const sandbox = await lizard.create('my-agent')
  await sandbox.kill()
  await lizard.templates.delete('my-agent')
}
