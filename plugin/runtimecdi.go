package plugin

// runtimeCDIRules say, by the runtime's name and version from NRI's
// Configure, when a runtime does not inject CDI devices named in an NRI
// adjustment although its NRI version would (see minCDINRIVersion); then
// emit: cdi falls back to edits, with one warning per connection. One
// function per runtime, each in its own file.
var runtimeCDIRules = []func(runtime, version string) (why string, drops bool){
	crioDropsCDI,
}

// runtimeDropsCDI applies runtimeCDIRules: the first rule that applies says
// why.
func runtimeDropsCDI(runtime, version string) (string, bool) {
	for _, rule := range runtimeCDIRules {
		if why, drops := rule(runtime, version); drops {
			return why, true
		}
	}
	return "", false
}
