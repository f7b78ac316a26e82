// Package auth decides who a client is and what it may do: the users file
// (read and written here, so its format has one owner), bcrypt credentials
// with a cache and a constant-cost refusal, the identity a verified client
// certificate gives, the TLS configuration of the listeners (reloaded on
// SIGHUP), and the role ACLs whose filters name the identity
// ({username}, {clientid}). Package broker applies it in mochi's hooks.
package auth
