// Options page: the platform URL and pairing (code shown here, approved in the SPA).
const $ = (id) => document.getElementById(id);
let polling = null;

async function render(state) {
  $('status').textContent = state?.status || 'unknown';
  const a = state?.account;
  $('account').textContent = a ? `as ${a.user} in ${a.tenant} (${a.device?.name || 'device'})` : '';
  $('error').textContent = state?.lastError || '';
}

async function init() {
  const { platformUrl = '' } = await chrome.storage.local.get('platformUrl');
  $('platform-url').value = platformUrl;
  render(await chrome.runtime.sendMessage({ type: 'getState' }));
}

chrome.runtime.onMessage.addListener((m) => {
  if (m?.type === 'state') render(m.state);
});

$('pair').addEventListener('click', async () => {
  const base = $('platform-url').value.trim().replace(/\/+$/, '');
  $('error').textContent = '';
  try {
    new URL(base);
  } catch {
    $('error').textContent = 'Enter the platform URL, e.g. https://agents.example.com';
    return;
  }
  await chrome.storage.local.set({ platformUrl: base });
  const resp = await fetch(`${base}/api/v1/browser/pairings/`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: $('device-name').value.trim() || 'Chrome' }),
  });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    $('error').textContent = body.message || `Pairing failed (${resp.status})`;
    return;
  }
  $('pairing').hidden = false;
  $('code').textContent = body.code;
  $('pairing-status').textContent = 'Waiting for approval…';
  clearInterval(polling);
  polling = setInterval(async () => {
    const r = await fetch(`${base}/api/v1/browser/pairings/${body.pairing_id}/token/`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ poll_secret: body.poll_secret }),
    });
    const answer = await r.json().catch(() => ({}));
    if (!r.ok) {
      clearInterval(polling);
      $('pairing-status').textContent = answer.message || 'Pairing failed.';
      return;
    }
    if (answer.status === 'approved') {
      clearInterval(polling);
      await chrome.storage.local.set({ deviceToken: answer.token, account: { user: answer.user.username, tenant: answer.tenant.slug, device: answer.device } });
      $('pairing-status').textContent = `Paired as ${answer.user.username}.`;
      render(await chrome.runtime.sendMessage({ type: 'paired' }));
    }
  }, (body.poll_interval_seconds || 2) * 1000);
});

$('unpair').addEventListener('click', async () => {
  render(await chrome.runtime.sendMessage({ type: 'unpair' }));
});

init();
