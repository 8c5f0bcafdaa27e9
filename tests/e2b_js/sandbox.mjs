// E2B's JavaScript SDK, unmodified: what its quickstart does, against the service the
// three exports name (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Prints one JSON line.
import { Sandbox, CommandExitError } from 'e2b'

const sbx = await Sandbox.create({ envs: { GREETING: 'hello' }, metadata: { suite: 'js' } })
try {
  const ran = await sbx.commands.run('echo $GREETING from $(whoami) in $(pwd)')
  const streamed = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.2; done', {
    onStdout: (data) => streamed.push(data),
  })
  let exitCode = null
  try {
    await sbx.commands.run('exit 4')
  } catch (error) {
    if (error instanceof CommandExitError) exitCode = error.exitCode
    else throw error
  }
  await sbx.files.write('/home/user/js/note.txt', 'written by node')
  const text = await sbx.files.read('/home/user/js/note.txt')
  const listed = (await sbx.files.list('/home/user/js')).map((entry) => entry.name)
  const found = await Sandbox.list({ query: { metadata: { suite: 'js' } } }).nextItems()
  console.log(JSON.stringify({
    id: sbx.sandboxId,
    stdout: ran.stdout,
    streamed: streamed.join(''),
    exitCode,
    text,
    listed,
    found: found.map((info) => info.sandboxId),
    host: sbx.getHost(3000),
  }))
} finally {
  await sbx.kill()
}
