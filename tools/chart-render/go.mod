// Not a module to build in module mode: see main.go. This file only lets GOPATH mode resolve
// sprig's "/v3" import path ("minimal module compatibility" applies in trees with a go.mod).
module chart-render

go 1.19
