package kafka

import "testing"

// TestSCRAMVector: the example exchange of RFC 7677 section 3
// (SCRAM-SHA-256), byte for byte.
func TestSCRAMVector(t *testing.T) {
	c := newSCRAM(scramSHA256)
	if err := c.Begin("user", "pencil", ""); err != nil {
		t.Fatal(err)
	}
	c.nonce = "rOprNGfwEbeRWgbNEkqO"
	first, err := c.Step("")
	if want := "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"; err != nil || first != want {
		t.Fatalf("client-first %q, %v; want %q", first, err, want)
	}
	final, err := c.Step("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
	if want := "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="; err != nil || final != want {
		t.Fatalf("client-final %q, %v; want %q", final, err, want)
	}
	if c.Done() {
		t.Fatal("done before the server's signature")
	}
	if _, err := c.Step("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="); err != nil || !c.Done() {
		t.Fatalf("server-final: %v, done %v", err, c.Done())
	}

	// A server that does not know the password cannot sign.
	c = newSCRAM(scramSHA256)
	c.Begin("user", "pencil", "")
	c.nonce = "rOprNGfwEbeRWgbNEkqO"
	c.Step("")
	c.Step("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
	if _, err := c.Step("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="); err == nil {
		t.Error("a wrong server signature was accepted")
	}
	// Nor pick a nonce that does not extend ours.
	c = newSCRAM(scramSHA512)
	c.Begin("user", "pencil", "")
	c.Step("")
	if _, err := c.Step("r=other,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"); err == nil {
		t.Error("a server nonce that does not extend the client's was accepted")
	}
}
