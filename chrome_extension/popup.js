// Popup: connection state, paired account, operation log, Stop (cancels pending commands).
const $ = (id) => document.getElementById(id);
const LABELS = { connected: 'Connected', connecting: 'Connecting…', disconnected: 'Disconnected', unpaired: 'Not paired' };

function render(state) {
  if (!state) return;
  $('status').textContent = LABELS[state.status] || state.status;
  $('dot').className = `dot ${state.status}`;
  document.body.dataset.status = state.status;
  const a = state.account;
  $('account').textContent = a ? `${a.user} · ${a.tenant} · ${a.device?.name || ''}` : 'Open “Pairing…” to connect this browser.';
  $('error').textContent = state.lastError || '';
  $('stop').disabled = !(state.pending && state.pending.length);
  const log = $('log');
  log.replaceChildren(...(state.log || []).slice(0, 15).map((e) => {
    const li = document.createElement('li');
    li.dataset.testid = 'log-entry';
    const time = new Date(e.ts).toLocaleTimeString();
    li.textContent = `${time} ${e.op} — ${e.status}${e.url ? ` · ${e.url}` : ''}`;
    if (String(e.status).startsWith('error') || e.status === 'cancelled') li.className = 'bad';
    return li;
  }));
}

chrome.runtime.onMessage.addListener((m) => {
  if (m?.type === 'state') render(m.state);
});
$('stop').addEventListener('click', async () => render(await chrome.runtime.sendMessage({ type: 'stop' })));
$('reconnect').addEventListener('click', async () => render(await chrome.runtime.sendMessage({ type: 'reconnect' })));
$('hand').addEventListener('click', async () => {
  const state = await chrome.runtime.sendMessage({ type: 'handTab' });
  $('hand-message').textContent = state?.handover?.message || '';
  render(state);
});
$('options').addEventListener('click', () => chrome.runtime.openOptionsPage());
chrome.runtime.sendMessage({ type: 'getState' }).then(render);
