// Background processes, terminals and port waits, used as a program would (checked by `npm run typecheck`).
import { Lizard, TimedOutError, type ProcessHandle, type PtyHandle, type ProcessInfo, type ListeningPort } from '@lizard-build/sdk'

async function background(): Promise<void> {
  const sandbox = await new Lizard({ project: 'my-project' }).create('base')
  const server: ProcessHandle = await sandbox.process.start('node /app/server.js', {
    cwd: '/app',
    envs: { PORT: '3000' },
    onStdout: (text: string) => console.log(text),
    onStderr: (text: string) => console.error(text),
  })
  try {
    await sandbox.waitForPort(3000, { timeoutMs: 30_000 })
    const ports: ListeningPort[] = await sandbox.listPorts()
    console.log(ports.map((p) => `${p.port} ${p.address} ${p.pid ?? ''} ${p.cmd ?? ''}`))
  } catch (e) {
    if (e instanceof TimedOutError) console.log(e.code)
  }
  const listed: ProcessInfo[] = await sandbox.process.list()
  const again = await sandbox.process.connect(server.pid, { onStdout: console.log })
  await again.sendStdin('input\n')
  await again.closeStdin()
  await sandbox.process.kill(server.pid, 'SIGTERM')
  const { stdout, exitCode }: { stdout: string; exitCode: number } = await again.wait()
  server.disconnect()
  const pty: PtyHandle = await sandbox.pty.create({ cols: 100, rows: 30, onData: (d: Uint8Array) => console.log(d.length) })
  await pty.sendInput('top\n')
  await pty.resize({ cols: 120, rows: 40 })
  await pty.kill()
  console.log(listed.length, stdout, exitCode, (await pty.wait()).exitCode)
}
void background
