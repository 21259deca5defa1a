// A real OpenID Provider for the single sign-on tests: panva's oidc-provider (OpenID Certified),
// with its development login and consent pages, RP-Initiated Logout and Back-Channel Logout.
//
// Configured from the environment: PORT, CLIENT_ID, CLIENT_SECRET, PLATFORM (the relying party's
// origin, e.g. http://127.0.0.1:8000). Every account id signs in, with the claims
// {sub: id, preferred_username: id, groups: ["acme-users"]}. Prints "READY <issuer>" once listening;
// each back-channel logout it sent prints "BACKCHANNEL ok <sid>" or "BACKCHANNEL error <message>".
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const platform = process.env.PLATFORM;
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.CLIENT_ID,
    client_secret: process.env.CLIENT_SECRET,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    redirect_uris: [`${platform}/oidc/callback/`],
    post_logout_redirect_uris: [`${platform}/`],
    token_endpoint_auth_method: 'client_secret_post',
    backchannel_logout_uri: `${platform}/oidc/backchannel-logout/`,
    backchannel_logout_session_required: true,
  }],
  async findAccount(ctx, id) {
    return {
      accountId: id,
      async claims() {
        return { sub: id, preferred_username: id, groups: ['acme-users'] };
      },
    };
  },
  claims: { openid: ['sub'], profile: ['preferred_username'], groups: ['groups'] },
  scopes: ['openid', 'profile', 'groups'],
  cookies: { keys: ['agent-platform-test-cookie-key'] },
  // The platform under test listens on loopback, which the provider's guard against
  // server-side request forgery refuses to call (its back-channel logout would fail): here only,
  // the requests go out without that guard's dispatcher.
  fetch: (url, options) => {
    const { dispatcher, ...rest } = options;
    return globalThis.fetch(url, rest);
  },
  features: {
    devInteractions: { enabled: true },
    backchannelLogout: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
});

provider.on('backchannel.success', (ctx, client, accountId, sid) => console.log(`BACKCHANNEL ok ${sid}`));
provider.on('backchannel.error', (ctx, err) => console.log(`BACKCHANNEL error ${err.message} ${err.cause ?? ''}`));
provider.on('server_error', (ctx, err) => console.log(`SERVER_ERROR ${err.stack}`));

provider.listen(port, '127.0.0.1', () => console.log(`READY ${issuer}`));
